"""``kvcache ab --more-rounds-within`` end to end on the tiny model: a first verdict inconclusive for a reason more
rounds can help, so that more rounds are taken on a new pair of workers, pooled (rounds renumbered) and judged
again, until the budget pays for no more and it says it gave up.

Nothing here depends on how fast or steady the machine is. The verdict: both sides' steps are made up
(``-p kv_ab_figures``), side B's 1% slower at each point it measures, across its workers, so that the paired drift
is beyond ``--kv-max-drift 0`` after the first session and after every extension (inconclusive, and more rounds
can help: they never decide it). The budget: the driver runs on a clock that advances 1 s each time it is read
(``tests/abdriver.py``), so the budget of 30 s pays for the same extensions on a quiet machine or a busy one: one
(about 20 readings), after which one more round would cost more than what is left."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.abdriver import command
from tests.kvrun import ROOT, environment

PLUGINS = Path(__file__).resolve().parent / "plugins"

COMMON = ["--", "--kv-model", "tiny", "--kv-contexts", "256,2048", "--kv-steps", "3", "--kv-warmup", "1",
          "--kv-copy-mib", "8", "--kv-caches", "dynamic", "--kv-counted-contexts", "64,128", "--kv-rounds", "1",
          "--kv-ledger-steps", "0", "--kv-max-drift", "0", "-p", "kv_ab_figures"]


def test_an_inconclusive_session_takes_more_rounds_pooled_with_the_first_then_gives_up(tmp_path):
    out = tmp_path / "ab.json"
    cmd = command("--out-dir", str(tmp_path / "logs"), "--json", str(out), "--more-rounds-within", "0.5",
                  "--b-env", f"KV_AB_FIGURES_SLOWER={tmp_path / 'b-points'}", *COMMON)
    done = subprocess.run(cmd, cwd=ROOT, env=environment([PLUGINS]), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-1500:])
    doc = json.loads(out.read_text())
    more = doc["ab_run"]["more_rounds"]
    assert more["budget_s"] == 30 and more["first_rounds"] == 1 and more["extensions"], more
    assert more["gave_up"] is True and more["stopped"] == "budget", more
    first = more["extensions"][0]
    assert first["rounds"] == 1 and first["first_round"] == 1 and first["why"] == ["dynamic timed (paired drift)"]
    assert more["rounds"] == 1 + sum(e["rounds"] for e in more["extensions"]) == doc["kv"]["settings"]["rounds"]
    for kv in (doc["kv"], doc["side_a"]["kv"]):  # every round of the pool once per context, the first's first
        keys = [(p["context"], p["round"]) for p in kv["points"]]
        assert sorted(keys) == sorted({(c, r) for c in (256, 2048) for r in range(more["rounds"])}), keys
        labels = [m["label"] for m in kv["copy"]["measurements"]]
        assert labels == ["start", "end"]  # an extension measures no copy bandwidth: the ratios are of seconds
    timed = doc["ab"]["dynamic"]["timed"]
    assert timed["status"] == "inconclusive" and "drift differs between the sides" in timed["reason"], timed
    assert more["inconclusive"] == ["dynamic timed"]
    assert "taking 1 more round(s) of the timed items (extension 1 of at most 3" in done.stderr
    assert "more rounds: gave up after" in done.stdout and "one more round would take about" in done.stdout
    assert "still inconclusive: dynamic timed" in done.stdout
    assert (tmp_path / "logs" / "a-more-1.log").is_file() and (tmp_path / "logs" / "b-more-1.log").is_file()
    assert "more_rounds" in doc["ab_run"]["phase_seconds"]
