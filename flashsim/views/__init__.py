"""What the notebooks show: view computations and panels (``widgets``), drawings
(``pictures``) and the backward pass's trade of FLOPs for bytes (``backward``). Nothing here
imports matplotlib or ipywidgets until a picture or a panel is made."""
