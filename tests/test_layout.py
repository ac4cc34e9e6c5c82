"""The package stands on its own (issue 11): no flashsim module imports benchmarks/, and
importing every flashsim module and loading every committed dataset, from another folder,
opens no file of the repository outside flashsim/ (an audit hook sees every open)."""

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = r"""
import importlib, json, pathlib, pkgutil, sys
root, package = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[1]) / "flashsim"
opened = []
def audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, pathlib.Path)):
        p = pathlib.Path(args[0] if not isinstance(args[0], bytes) else args[0].decode())
        p = p if p.is_absolute() else pathlib.Path.cwd() / p
        prefix = pathlib.Path(sys.prefix)           # a virtual environment may live in the tree
        if root in p.parents and package not in p.parents and prefix not in p.parents:
            opened.append(str(p))
sys.addaudithook(audit)
import flashsim
names = [m.name for m in pkgutil.walk_packages(flashsim.__path__, "flashsim.")]
for name in names:
    importlib.import_module(name)
from flashsim import measured
data = sorted(p.name for p in measured.DATA_DIR.glob("*.json"))
for name in data:
    measured.load(name)
measured.validation.stored_rows()
print(json.dumps({"modules": names, "datasets": data, "opened": opened,
                  "benchmarks": sorted(m for m in sys.modules if m.split(".")[0] == "benchmarks")}))
"""


def test_no_flashsim_module_imports_benchmarks():
    for f in sorted((ROOT / "flashsim").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            assert not any(n.split(".")[0] == "benchmarks" for n in names), f


def test_importing_and_loading_reads_nothing_outside_the_package(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NUMBA_ENABLE_CUDASIM": "1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "flashsim.measured.validation" in out["modules"] and "ncu_h200.json" in out["datasets"]
    assert out["opened"] == [] and out["benchmarks"] == []
