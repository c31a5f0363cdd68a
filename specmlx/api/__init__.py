"""The API floor: load a target (and a drafter) once, then generate, stream or chat.

    import specmlx
    models = specmlx.load("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    result = specmlx.generate(models, "def quicksort(xs):", specmlx.GenerationConfig(k=4))

Modules: `config` (GenerationConfig, and which method it runs), `models` (Models),
`methods` (the table of drafting methods), `options` (each method's options) and
`option_names` (their names on the command line and in batch lines), `load`, `calibration` (the call costs adaptive k
prices, cached per device), `session` (one loaded pair's target sequence, drafter and
policies), `generate` (generate and stream), and `chat`. It may import the drafters, the
heads, the engine and io; the floors above it (testing, training, bench, server, cli) import
it. Nothing is imported here, so that the CLI's option parsing can read the methods table
without loading MLX.
"""
