"""``python -m ship_sqla``: the ``ship-sqla`` command line."""

from ship_sqla._cli import main

if __name__ == "__main__":
    main()
