"""The drafters floor: one file per drafting strategy, each a `specmlx.engine.step.Drafter`.

`draft_model` (a small model of the same tokenizer), `ngram` (prompt lookup), `lookahead`
(Jacobi iteration), `medusa` and `eagle` (trees from the heads in `specmlx.heads`), `mtp`
(chains from the target's own MTP layer); `calibration` corrects the heads' tree scores by
what the target went on to say. A
drafter imports the engine and the heads only; the methods table (`specmlx.api.methods`)
builds it. Adding one is a file here plus an entry in that table (docs/how-it-works.md).
"""
