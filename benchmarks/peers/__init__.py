"""What the GPU machine lacks and the benchmarks measure beside ours: how it gets there (it can
neither download nor, in its time budget, build them). Not measuring scripts themselves."""
