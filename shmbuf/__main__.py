import sys

from shmbuf.cli import main

sys.exit(main())
