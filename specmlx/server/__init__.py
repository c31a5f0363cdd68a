"""An OpenAI-compatible HTTP server over one loaded target and drafter (`specmlx serve`).

`protocol` is the wire format, `engine` the one-at-a-time generation worker over one
`specmlx.api.session.Session`, `app` the FastAPI app. It sits above the API, beside the
bench; the command that starts it is `specmlx.cli.serve`. Nothing heavy is imported here.
"""
