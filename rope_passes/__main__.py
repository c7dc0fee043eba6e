import sys

from rope_passes.cli import main

sys.exit(main())
