"""The model benchmark suite behind bench/models.py, one job per module:

- variants:  the variant grammar (native and its PYTORCH_CUDA_ALLOC_CONF
             settings, torchalloc policies and their TORCHALLOC_CONF keys)
- workloads: the models, their data and one training step, built from
             configs with random weights (nothing is downloaded)
- child:     one (workload, variant) run in its own process: install the
             allocator, train, measure, print one tagged JSON line
- runner:    the parent: the plan, interleaved rounds, time budget,
             timeouts, progress on stderr, results written as it goes
- table:     summaries per (workload, variant), ratios to native, text and
             Markdown tables, the issue's targets

bench/ scripts may import torchalloc; torchalloc never imports them.
"""
