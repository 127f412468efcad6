"""``python -m distir``: the ``distir`` console script (``distir.cli.main``)."""

from distir.cli import main

if __name__ == "__main__":
    main()
