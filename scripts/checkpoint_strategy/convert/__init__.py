"""`convert`: checkpoint layouts to one another (torch zip, safetensors, DCP, DeepSpeed ZeRO), read as data,
streamed, checked tensor by tensor (see core.py and docs/convert.md)."""
