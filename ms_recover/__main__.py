"""``python -m ms_recover ARGS`` is ``ms-recover ARGS`` with this interpreter (the scheduler hook
script runs ``python -m ms_recover hook start`` with the python the job chose)."""

import sys

from ms_recover.cli import main

sys.exit(main())
