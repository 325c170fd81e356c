"""Score-item images, normalised to data URLs; the checkpoint
(`grm_service.gateway.request.checkpoint`) checks them on their way to the engine, with the same
limits as chat images.

The original bytes are kept (never re-encoded) so the replica sees exactly what the client sent,
and nothing is decoded here: bare base64 gets its media type from its first bytes.
"""

from __future__ import annotations

from grm_service.mime import is_data_url, sniff_mime
from grm_service.scoring.context import ItemError


def to_data_url(value: str) -> str:
    """A `data:<mime>;base64,...` URL of the same bytes; ItemError when it cannot be one."""
    value = value.strip()
    if is_data_url(value):
        return value
    if "://" in value[:16] or value.startswith("file:"):
        raise ItemError("image must be inline (data URL or base64), not a URL: a fetched "
                        "image can change between runs")
    mime = sniff_mime(value)
    if mime is None:
        raise ItemError("image is neither a data URL nor base64 of a PNG, JPEG, WebP, GIF, BMP "
                        "or TIFF")
    return f"data:{mime};base64,{value}"
