"""The one reader of a number that a file gives phrasescore: a weight (a ``--weights`` file,
a moses.ini's ``[weight]``, a tuner's ``weights.txt``), an n-best feature value or total, a
phrase-table score.

It takes what Moses' C parsers take (``strtod``/``atof`` in the C locale, as Moses, mert and
extractor read these files) and refuses what only Python's ``float`` would read:

* ASCII decimal numbers: ``[+|-] digits [. digits] [(e|E) [+|-] digits]`` (``.5`` and ``5.``
  too), and ``inf``, ``infinity`` and ``nan`` in any case, with a sign; whether a non-finite
  value may stand where it is found is the caller's rule (a weight or a table score must be
  finite). ``1_0`` (Python's 10) and digits of other scripts (``٠.٥``, ``５``: Python's 0.5 and 5)
  are not numbers to ``strtod``, and are refused. Hexadecimal floats (``0x1p-3``), which
  ``strtod`` reads but Moses' phrase-table loader (a C++ stream) reads as 0, are refused too.
* A number whose digits are not all 0 but which reads as 0 (``1e-400``, below the smallest
  subnormal double): ``strtod`` returns 0 and sets ``ERANGE``, so Moses would use 0, which is
  not what was written. It is refused, whatever the number is: for a weight or a feature value
  0 is not the value written, and for a probability column it is ln 0 (floored to -100 by
  Moses), a score no table should hold. A subnormal (``1e-310``) is read as it is.
* ``-0``: ``strtod`` reads a negative zero, which is 0 in every sum and product Moses makes.
  It is read as 0, so that phrasescore never writes it back as ``-0`` (a weight in a moses.ini,
  a feature value in a list).
"""

from __future__ import annotations

import re

_NONZERO_MANTISSA = re.compile(r"[1-9]")


class NotANumber(ValueError):
    """A token that :func:`parse_number` refuses; :meth:`message` says why, naming ``what``."""

    def __init__(self, text: str, underflow: bool = False):
        super().__init__(text)
        self.text = text
        self.underflow = underflow

    def message(self, what: str) -> str:
        """``what is not a number: 'x'`` with the reason when it is not plain."""
        if self.underflow:
            return (
                f"{what} is {self.text}: too small for a number, it would be read as 0 "
                "(the smallest is 4.9e-324)"
            )
        hint = ""
        if not self.text.isascii():
            hint = " (Moses reads ASCII digits only)"
        elif "_" in self.text:
            hint = " (write it without '_')"
        return f"{what} is not a number: {self.text!r}{hint}"


def underflows(text: str) -> bool:
    """Whether ``text``, a number read as 0, was written with a digit other than 0 before its
    exponent (``1e-400``): what was given is not what is read."""
    mantissa = re.split("[eE]", text, maxsplit=1)[0]
    return bool(_NONZERO_MANTISSA.search(mantissa))


def parse_number(text: str) -> float:
    """The value of one token ``text`` (no spaces) as ``strtod`` reads it, within the rules of
    the module docstring: raises :class:`NotANumber` for what ``strtod`` does not read as
    written. Python's ``float`` decides every ASCII token without ``_`` (the same numbers as
    ``strtod``'s decimal form, and fast); only a 0 is looked at again."""
    if text.isascii() and "_" not in text:
        try:
            value = float(text)
        except ValueError:
            raise NotANumber(text) from None
        if value != 0.0:
            return value
        if underflows(text):
            raise NotANumber(text, underflow=True)
        return 0.0  # -0 included
    raise NotANumber(text)
