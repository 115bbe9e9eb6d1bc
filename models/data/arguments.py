"""The command-line options that say how to read the user's data set, for every verb that takes
``--dataset`` (``trickle train nexume``, ``trickle bench nexume``): one definition, so they read a
file alike. No torch: a verb reads the data, and fails on bad data, before it imports the training stack.

    add_user_data_arguments(parser, "nexume")          # --label-column, --id-column, ... --ignore-column
    fields = user_data_fields(args)                    # TrainConfig fields (None: not given)
"""

from __future__ import annotations

import argparse
from typing import Any

FILLS = ("linear", "previous", "zero")  # models.data.userdata.Fill
# the options' destinations (argparse's names), for a verb that checks which of them were given
DESTS = ("label_column", "id_column", "time_column", "pad", "fill", "drop_missing_labels", "ignore_column", "split_column",
         "delimiter", "decimal")
TAB = {"\\t": "\t", "tab": "\t"}  # --delimiter as a shell passes a tab


def add_user_data_arguments(p: argparse.ArgumentParser, who: str) -> None:
    """Add the options to ``p``; ``who`` starts each help line (the verb or algorithm they apply to)."""
    p.add_argument("--label-column", help=f"{who}, your table: the column of class labels (default label)")
    p.add_argument("--id-column", help=f"{who}, your table in long format (a row per time step): the column naming "
                                       "each example; without it a table is wide (a row per example)")
    p.add_argument("--time-column", help=f"{who}, long format: the column ordering an example's rows")
    p.add_argument("--pad", action="store_true", help=f"{who}, your data: zero-pad series of unequal length")
    p.add_argument("--fill", choices=FILLS,
                   help=f"{who}, your data: fill empty cells along time (linear interpolation, the previous value, or "
                        "zero); without it an empty cell is an error naming its row and column")
    p.add_argument("--drop-missing-labels", action="store_true",
                   help=f"{who}, your data: leave out examples without a label (otherwise an error naming them)")
    p.add_argument("--ignore-column", action="append", metavar="NAME",
                   help=f"{who}, your table: a column that is not part of the series (a name, a note; repeatable)")
    p.add_argument("--split-column", metavar="NAME",
                   help=f"{who}, your table: a column of train/test per row (long format: per example) whose split "
                        "is kept; without it a stratified 20 %% is held out")
    p.add_argument("--delimiter", metavar="CHAR",
                   help=f"{who}, your CSV: the field separator (',', ';', tab as '\\t', '|'); default: sniffed")
    p.add_argument("--decimal", choices=(".", ","),
                   help=f"{who}, your CSV: the decimal mark; default: a comma where fields are not comma-separated "
                        "and numbers are written so (a European spreadsheet's export)")


def user_data_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The options as ``models.nexume.config.TrainConfig`` fields; None where an option was not given
    (so a config file's value stands)."""
    return {"label_column": args.label_column, "id_column": args.id_column, "time_column": args.time_column,
            "pad": args.pad or None, "fill": args.fill, "drop_missing_labels": args.drop_missing_labels or None,
            "ignore_columns": args.ignore_column, "split_column": args.split_column,
            "delimiter": TAB.get(args.delimiter, args.delimiter), "decimal": args.decimal}


def given(args: argparse.Namespace) -> list[str]:
    """The options that were given, as the user typed them (``--pad``)."""
    return ["--" + d.replace("_", "-") for d in DESTS if getattr(args, d) not in (None, False)]
