import sys

from sglang_ds41.cli import main

sys.exit(main())
