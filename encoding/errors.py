"""Errors of the encoding pipeline."""

from sglang_ds41.errors import Ds41Error


class EncodingError(Ds41Error):
    """A request the V4.1 format cannot express (the official renderer rejects it too).

    `status_code` mirrors the official renderer: 400 for a request that is well-formed JSON but
    invalid, None for a body that does not deserialize at all.
    """

    def __init__(self, message: str, status_code: int | None = 400) -> None:
        super().__init__(message)
        self.status_code = status_code
