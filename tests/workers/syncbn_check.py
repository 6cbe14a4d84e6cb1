"""Worker for tests/test_syncbn.py: synchronised BN vs BN on the whole global batch (argv: --sizes)."""
from helpers.syncbn import check_main

check_main()
