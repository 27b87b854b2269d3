"""Everything this tool knows about llama.cpp's ``llama-server``, in one place.

``options`` (its option table and what each option means for a cert), ``option_table``
(the table parsed from the pinned build's ``--help``), ``flags`` (the one reader of its argv
and ``LLAMA_ARG_*`` variables), ``env`` (which variables it reads), ``chat_template`` (its
ChatML fallback) are pure; ``probes`` (its read-only endpoints), ``engine`` (the adapter: the
one argv builder) and ``help`` (reading a binary's ``--help``) touch the outside.
"""
