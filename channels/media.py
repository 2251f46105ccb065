"""What every channel's media fetcher shares: the limits from the `[attachments]` settings."""

from __future__ import annotations

from daemon.core.config import AttachmentSettings
from daemon.store.attachments import AttachmentLimits

MIB = 1024 * 1024


def attachment_limits(settings: AttachmentSettings) -> AttachmentLimits:
    """The limits a channel's downloads are stored under (`daemon.store.attachments`)."""
    return AttachmentLimits(image_max_side=settings.image_max_side,
                            image_max_bytes=settings.image_max_mb * MIB,
                            file_max_bytes=settings.file_max_mb * MIB)
