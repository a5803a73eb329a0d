"""``python -m autellix_vllm`` is the ``autellix`` console script."""

import sys

from autellix_vllm.cli import main

sys.exit(main())
