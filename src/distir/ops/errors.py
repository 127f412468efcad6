"""The op layer's errors: a registry misuse (``RegistryError``), an unknown op name
(``UnknownOpError``) and an op's rule rejecting its input types or attributes (``OpTypeError``).
Below the registry and DTensor type inference, which both raise them."""

from __future__ import annotations


class RegistryError(ValueError):
    pass


class UnknownOpError(RegistryError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class OpTypeError(ValueError):
    """An op's rule rejected its input types/attributes. ``index`` names the input, if any."""

    def __init__(
        self, message: str, index: int | None = None, expected: object = None, actual: object = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.index = index
        self.expected = expected
        self.actual = actual
