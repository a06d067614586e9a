import sys

from checkpoint_strategy.cli import main

sys.exit(main())
