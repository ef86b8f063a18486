"""``python -m anchorlens`` (also under torchrun)."""

from anchorlens.cli import main

main()
