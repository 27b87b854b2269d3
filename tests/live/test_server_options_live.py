"""The committed option table is the provisioned llama-server's own ``--help``, and every
option it lists is classified or treated as unknown."""

from __future__ import annotations

from batch_invariance.engines.llama_server import options as server_options
from batch_invariance.engines.llama_server.flags import read_flags
from batch_invariance.engines.llama_server.help import options_of
from batch_invariance.engines.llama_server.option_values import KINDS
from batch_invariance.provision.embedded import Provisioned

#: A value each kind reads as written ("1" for the rest: a number, a switch or a name).
EXAMPLE = {"cpu_range": "0-1", "logit_bias": "1+1", "scaled": "a.gguf:1"}


def test_the_committed_table_is_the_real_binarys_help(live_pair: Provisioned) -> None:
    parsed = options_of(live_pair.server_bin)
    assert parsed == server_options.OPTIONS
    assert server_options.TABLE_BUILD in str(live_pair.server_bin)
    names = [n for spec in parsed for n in (*spec.names, *spec.negatives)]
    assert len(names) == len(set(names))  # one option per spelling
    for spec in parsed:
        kind = server_options.option_class(spec)
        assert kind in ("neutral", "owned", "compared", "unclassified")
        # Every spelling, and its --snake_case form, is read as this option ...
        for name in (*spec.names, *spec.negatives):
            assert server_options.lookup(name) == spec
            if name.startswith("--"):
                assert server_options.lookup("--" + name[2:].replace("-", "_")) == spec
        # ... and an unclassified one is named as such by the reader.
        argv = [spec.names[0], *[EXAMPLE.get(KINDS.get(spec.canonical, ""), "1")] * spec.nvalues]
        flags = read_flags(argv, first_is_binary=False)
        assert (flags.unclassified() == (spec.names[0],)) is (kind == "unclassified")
    # The classes name only options the binary has.
    known = {spec.canonical for spec in parsed}
    assert set(server_options.NEUTRAL) <= known and set(server_options.OWNED) <= known
    assert known >= server_options.COMPARED
