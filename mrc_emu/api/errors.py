"""The errors of the controller API mirror: the header's errno values, as exceptions.

Why it exists: mrc_ctl.h returns -1 and sets errno (EINVAL, E2BIG, EBUSY, ...); a Python
mirror raises instead, keeping the errno so a reader can match it against the header. Every
message is one line and starts with the attribute it is about ("fields[1].mask: ...").
They are ValueErrors: the command line prints them as one line and exits 1.
"""

from __future__ import annotations

import errno as _errno


class MrcApiError(ValueError):
    """A call the header would fail with -1/errno: a transition or attribute not allowed."""

    def __init__(self, message: str, errno: int = _errno.EINVAL):
        super().__init__(message)
        self.errno = errno
        self.errno_name = _errno.errorcode.get(errno, str(errno))


class RestrictionError(MrcApiError):
    """A field, count or mask breaks one of the restrictions mrc_ctl.h lists for a profile."""
