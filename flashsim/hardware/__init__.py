"""The hardware side of the model: GPU presets (``presets``), the L2 level between SRAM and
DRAM (``l2``) and the time model (``timing``)."""
