"""``kvcache history add|plot``: the arguments and the exit status; the store, the entries, the steps and the
trend PNGs are :mod:`kvcache.analysing.history`'s."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kvcache import cli, exits
from kvcache.analysing import arguments, files, history
from kvcache.analysing.history import HistoryError, plot_files
from kvcache.analysing.records import RecordError, load_run


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="kvcache history",
        description="Keep runs across commits or releases and draw their trend. 'add RUN.json --store FILE' appends "
        "one entry (the commit from --commit, by default git rev-parse HEAD, or --release), atomically, refusing "
        "an entry whose commit or release and identity are stored already. 'plot --store FILE --out DIR' writes "
        "one trend PNG per measure (classes as lines across the entries: commits as added, releases by version) "
        "with the steps marked by their commit (counted: every change; timed: where the intervals of two levels "
        "do not overlap), steps.json and steps.md.",
    )
    sub = made.add_subparsers(dest="action", required=True, metavar="add|plot")
    adding = sub.add_parser("add", help="append a run to the store")
    adding.add_argument("run", metavar="RUN.json", help="a pytest --benchmark-json file of the suite")
    adding.add_argument("--store", required=True, metavar="FILE", help="the history, JSON lines")
    where = adding.add_mutually_exclusive_group()
    where.add_argument("--commit", metavar="REV", help="the commit the run measured, resolved to its full sha by git "
                       "(default: git rev-parse HEAD)")
    where.add_argument("--release", metavar="VERSION", help="a release the run measured, instead of a commit "
                       "(a release number; v5.23.0, 5.23 and 5.23.0.0 are stored as 5.23.0)")
    plotting = sub.add_parser("plot", help="draw the trend PNGs")
    plotting.add_argument("--store", required=True, metavar="FILE", help="the history, JSON lines")
    plotting.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs and steps.json")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(parser, work, argv, errors=(HistoryError, RecordError))


def work(args: argparse.Namespace) -> int:
    """``add``: one entry appended to the store; ``plot``: the trend PNGs and the steps, written into a temp folder
    beside ``--out`` and moved into it whole (:func:`kvcache.analysing.files.staged_folder`)."""
    if args.action == "add":
        if args.commit is not None and (not args.commit.strip() or any(c.isspace() for c in args.commit)):
            raise HistoryError(f"--commit {args.commit!r} must be one word, not empty")
        try:
            release = None if args.release is None else arguments.release("--release", args.release)
        except ValueError as exc:
            raise HistoryError(str(exc)) from None
        if arguments.paths_refused("kvcache history", reads=[("RUN.json", args.run)],
                                   writes=[("--store", args.store)]):
            return exits.USAGE_ERROR
        run = load_run(args.run)
        commit = history.resolve_commit(args.commit) if args.commit else None if release else history.git_head()
        notes: list[str] = []
        entry = history.entry_of(run, commit=commit, release=release, notes=notes)
        for note in notes:
            cli.say(f"kvcache history: {note}", err=True)
        history.add(args.store, entry)
        cli.say(f"kvcache history: added {history.entry_key(entry)[0]} ({entry.setup}, "
                f"{len(entry.caches)} classes) to {args.store}")
        return exits.PASS
    if arguments.paths_refused("kvcache history", reads=[("--store", args.store)],
                               folders=[("--out", args.out, plot_files())]):
        return exits.USAGE_ERROR
    entries = history.ordered(history.read_store(args.store))
    if not entries:
        raise HistoryError(f"--store {args.store}: no entries (add some with kvcache history add)")
    try:
        with files.staged_folder("--out", args.out, plot_files(), keep=(HistoryError,)) as stage:
            written, steps = history.plot(entries, stage)
    except HistoryError as exc:  # no matplotlib: named by --out, not the temp folder
        raise HistoryError(str(exc).replace(str(stage), str(args.out))) from None
    for step in steps:
        cli.say(f"step: {step.cache} {step.measure} at {step.label}: {step.before:.4g} -> {step.after:.4g} "
                f"({step.delta:+.4g})")
    print(f"kvcache history: {len(entries)} entries, {len(steps)} steps; wrote "
          f"{', '.join(p.name for p in written)}, steps.json and steps.md to {args.out}")
    return exits.PASS
