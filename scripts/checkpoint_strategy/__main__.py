import sys

from checkpoint_strategy.cli.main import main

sys.exit(main())
