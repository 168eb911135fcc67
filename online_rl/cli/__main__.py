"""`python -m online_rl.cli` runs the command line (same as `online-rl`)."""

from online_rl.cli.app import main

if __name__ == "__main__":
    main()
