"""Same as `headcount-report <multirun dir>`: compare the runs of a sweep in <multirun dir>/report/."""

from headcount.cli.report import main

if __name__ == "__main__":
    main()
