"""Constrained decoding and logprobs on a real GPU (run with `pytest -m gpu tests/gpu`): a step whose rows sample
partly on the host (logprobs) keeps the other rows on the device sampler and reads back only the host rows' logits
(ModelRunner.sampled_step_logits, the rows' offsets into the device's logits buffer); every row's tokens equal
those of the same step sampled wholly on the host, and the grammar's row is valid JSON.

The model: $ROCMFORGE_DEMO_MODEL, else the installed demo model (random weights of its shape serve too).
"""

from __future__ import annotations

import json

import pytest

from test_model_gpu import model_path

from hipcore.engine.engine import Engine
from hipcore.engine.grammar import GrammarVocabulary, TokenConstraint, compile_grammar
from hipcore.engine.loader import LoadOptions, load_model
from hipcore.engine.sampler import SamplingParams

pytestmark = pytest.mark.gpu
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_mixed_steps_give_the_all_host_tokens(gpu):
    # greedy free rows: the device's and the host's picks agree exactly (a seeded draw may differ by float32
    # rounding where a cumulative sum meets its threshold), so a difference is a wrong row's logits
    free = [SamplingParams(temperature=0.0, max_tokens=24 + i, ignore_eos=True) for i in range(6)]
    # the grammar's row samples on the device (under its token mask) in the mixed run and on the host in the other (a
    # step with a host row and no sampled_step_logits samples every row on the host): seeded, its draws can differ
    # only where a cumulative sum lies within float32 rounding of the draw (greedy, a random model's integer may
    # run to max_tokens and never close the JSON)
    constrained = SamplingParams(temperature=0.8, seed=7, max_tokens=48, grammar=compile_grammar(json_schema=SCHEMA))
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=24, logprobs=3, ignore_eos=True)
    jobs = free[:3] + [constrained] + free[3:] + [with_logprobs]
    with load_model(model_path(), LoadOptions(max_seqs=16, ctx_size=512), device=gpu) as loaded:
        runs = []
        for mixed in (True, False):
            runner = loaded.runner
            if not mixed:
                runner.sampled_step_logits = None  # every row of such a step on the host, as the engine did before
            try:
                engine = Engine(runner, loaded.tokenizer, loaded.cache, max_seqs=16, max_step_tokens=256)
                ids = [engine.submit([1, 9690, 198, 300 + i], params) for i, params in enumerate(jobs)]
                engine.run_until_idle()
                runs.append([engine.finished_record(i) for i in ids])
            finally:
                if not mixed:
                    del runner.sampled_step_logits
        assert [r.generated_tokens for r in runs[0]] == [r.generated_tokens for r in runs[1]]
        record = runs[0][3]
        if record.ending.value == "length":  # a random model's string or integer may run to max_tokens: every token
            grammar = TokenConstraint(GrammarVocabulary(loaded.tokenizer), compile_grammar(json_schema=SCHEMA))
            for token in record.generated_tokens[0]:  # of the cut answer is one the grammar allows there
                assert grammar.allowed()[token], (token, record.texts[0])
                grammar.accept(token)
        else:
            value = json.loads(record.texts[0])
            assert set(value) == {"name", "age"} and isinstance(value["age"], int)
