"""What the suite measures and in which order: the suite files a session leaves out, the parametrization of its
tests, and the order of its items.

Order of a session: counted traffic of every class (deterministic), then the copy bandwidth, then ``--kv-rounds``
rounds of timed points (interleaved across classes and contexts, the copy bandwidth measured again at each round's
start), the re-measured noisiest points, the ledger, the copy bandwidth at the end, and last the first timed point
measured again for the drift check. The functions that make the points and the order are pure
(:func:`timed_points`, :func:`ledger_points`, :func:`copy_labels`, :func:`measuring_order`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kvcache.analysing.settings import Settings
from kvcache.plugin.discovery import in_suite, item_role
from kvcache.plugin.startup import check_before_running, state_for_suite
from kvcache.plugin.state import PROBLEM, STATE, state_of

Item = TypeVar("Item")


def timed_points(settings: Settings) -> list[Any]:
    """Every (cache, context, round), in the order they are measured."""
    from kvcache.measuring.session import PointId

    out = []
    for r in range(settings.rounds):
        contexts = list(settings.contexts)
        if settings.order == "ascending":
            out += [PointId(c, n, r) for c in settings.caches for n in sorted(contexts)]
            continue
        random.Random(settings.seed * 1000 + r).shuffle(contexts)
        out += [PointId(c, n, r) for i, n in enumerate(contexts) for c in _rotated(settings.caches, i)]
    return out


def ledger_points(settings: Settings) -> list[Any]:
    """One profiled (cache, context) per class and context (none with --kv-ledger-steps 0), contexts in a seeded
    shuffled order with the classes rotated, like a timed round: a machine slowing down during the ledger must not
    read as time growing with context."""
    from kvcache.measuring.session import PointId

    if not settings.profiles_ledger:
        return []
    contexts = list(settings.contexts)
    random.Random(settings.seed * 1000 + 999).shuffle(contexts)
    return [PointId(c, n, 0) for i, n in enumerate(contexts) for c in _rotated(settings.caches, i)]


def _rotated(caches: tuple[str, ...], i: int) -> tuple[str, ...]:
    """The classes rotated by ``i`` places, so that each class goes first at some context."""
    k = i % len(caches)
    return caches[k:] + caches[:k]


def copy_labels(settings: Settings) -> list[str]:
    """The copy-bandwidth measurements: at the start, at the start of each later round, at the end."""
    return ["start", *(f"round-{r}" for r in range(1, settings.rounds)), "end"]


def measuring_order(roles: list[tuple[str, Any, Item]], settings: Settings) -> list[Item]:
    """The items in measuring order, from ``(role, key, item)`` of each (:func:`kvcache.plugin.discovery.item_role`):
    others and counted traffic first; with timed points, the start copy, the rounds' points in :func:`timed_points`
    order (each later round opened by its copy), re-measurements, ledger, the end copy and the drift check; without,
    re-measurements, ledger and drift. A copy item left over is kept, at the end."""
    others = [item for role, _, item in roles if role == "other"]
    counted = [item for role, _, item in roles if role == "counted"]
    copies = {key: item for role, key, item in roles if role == "copy"}
    points = {key: item for role, key, item in roles if role == "point"}
    drift = [item for role, _, item in roles if role == "drift"]
    remeasure = [item for role, _, item in roles if role == "remeasure"]
    ledgers = [item for role, _, item in roles if role == "ledger"]
    ordered = others + counted
    if points:
        if "start" in copies:
            ordered.append(copies.pop("start"))
        current_round = 0
        for point in timed_points(settings):
            if point.round != current_round:  # each later round starts with the copy bandwidth again
                current_round = point.round
                if f"round-{current_round}" in copies:
                    ordered.append(copies.pop(f"round-{current_round}"))
            if point in points:
                ordered.append(points[point])
        ordered += remeasure + ledgers
        if "end" in copies:
            ordered.append(copies.pop("end"))
        ordered += drift
    else:
        ordered += remeasure + ledgers + drift
    return ordered + list(copies.values())  # anything selected is kept, in order or not


# --- hooks ---------------------------------------------------------------------------------------------

def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without ``--kv-remeasure`` there is nothing to re-measure, with ``--kv-ledger-steps 0`` or ``--kv-compile``
    no ledger: their test files are not collected."""
    off = {"test_remeasure.py": lambda s: s.remeasure == 0,
           "test_ledger.py": lambda s: not s.profiles_ledger}
    if collection_path.name not in off or not in_suite(config, collection_path):
        return None
    state = state_for_suite(config)
    return True if state is not None and off[collection_path.name](state.settings) else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not in_suite(metafunc.config, metafunc.definition.path):
        return  # a fixture of the same name elsewhere is not the suite's
    state = state_for_suite(metafunc.config)
    if state is None:
        return
    s = state.settings
    if "kv_point" in metafunc.fixturenames:
        points = timed_points(s)
        metafunc.parametrize("kv_point", points, ids=[p.test_id(s.rounds) for p in points])
    if "kv_cache" in metafunc.fixturenames:
        metafunc.parametrize("kv_cache", list(s.caches))
    if "kv_copy_label" in metafunc.fixturenames:
        metafunc.parametrize("kv_copy_label", copy_labels(s))
    if "kv_ledger" in metafunc.fixturenames:
        points = ledger_points(s)
        metafunc.parametrize("kv_ledger", points, ids=[f"{p.cache}-{p.context}" for p in points])
    if "kv_remeasure" in metafunc.fixturenames:
        metafunc.parametrize("kv_remeasure", list(range(s.remeasure)), ids=[f"noisiest-{k + 1}"
                                                                          for k in range(s.remeasure)])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """When the suite's items are collected: the checks, if the arguments did not show the suite at start-up,
    then the items in measuring order (after any deselection by -k/-m)."""
    if STATE not in config.stash and PROBLEM not in config.stash:
        return  # every suite item passed pytest_generate_tests, which makes one of them
    if not any(in_suite(config, item.path) for item in items):
        return
    if PROBLEM in config.stash:
        raise pytest.UsageError(config.stash[PROBLEM])
    state = state_of(config)
    if not state.checked:
        check_before_running(config, state)
    items[:] = measuring_order([(*item_role(item), item) for item in items], state.settings)
