"""What a conversion raises when it cannot run."""

from __future__ import annotations

from sglang_ds41.errors import Ds41Error


class ConvertError(Ds41Error):
    """The conversion cannot run: bad source, unsupported request, unusable target."""
