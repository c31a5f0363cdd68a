"""The training floor: heads trained on a target's own hidden states.

`data` (the corpus and the target's features, cached in `shards`), `objectives` (each head
kind's loss), `train` (the resumable loop), `checkpoint`, and `vocab` (what a reduced draft
vocabulary keeps). It sits above the API (it loads targets and decodes with them) and below
the commands; nothing but the CLI imports it, so inference never pays for it.
"""
