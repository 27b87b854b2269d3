"""The demo's bundled work-set and defaults: a base model on the raw completions endpoint,
enough distinct prompts for a GREEN to be possible, answers long enough for the floor."""

from __future__ import annotations

import math

from batch_invariance.commands.demo import DEMO_DEFAULTS, DEMO_WORKSET
from batch_invariance.core.evidence import DEFAULT_MAX_BOUND, DEFAULT_MIN_ANSWER_TOKENS
from batch_invariance.run.workset import bundled_workset_path, load_workset

#: The distinct prompts a GREEN needs: the rule-of-three bound 3/n must reach the max bound.
MIN_DISTINCT_PROMPTS = math.ceil(3 / DEFAULT_MAX_BOUND)
MIN_ANSWER_TOKENS = DEFAULT_MIN_ANSWER_TOKENS


def test_demo_runs_completion_openings_on_the_completions_endpoint() -> None:
    assert DEMO_DEFAULTS.endpoint == "completions"
    items = load_workset(bundled_workset_path(DEMO_WORKSET)).items
    # A messages row would be sent to the chat endpoint, i.e. through a fallback template.
    assert all(i.messages is None and i.system is None and i.prompt for i in items)
    assert len(items) >= 32
    assert len({i.test_id for i in items}) == len(items)
    assert len({i.prompt for i in items}) >= MIN_DISTINCT_PROMPTS
    # An opening that ends a sentence invites the base model to stop; these stop mid-way.
    assert not [i.test_id for i in items if (i.prompt or "").rstrip().endswith((".", "!", "?"))]


def test_demo_answers_are_long_enough_for_the_floor() -> None:
    # 1.5x the floor: a median under it would make the cell unpromotable for length alone.
    assert DEMO_DEFAULTS.n_predict >= 96 >= 1.5 * MIN_ANSWER_TOKENS
    assert DEMO_DEFAULTS.gate_passes >= 3 and DEMO_DEFAULTS.parallel >= 2
