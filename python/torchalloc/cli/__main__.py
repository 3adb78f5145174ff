"""`python -m torchalloc.cli ARGS`: the `torchalloc` command without the console script."""
import sys

from .dispatch import main

sys.exit(main())
