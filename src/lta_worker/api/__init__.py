"""The Python API for an application that embeds lta-worker (docs/python-api.md): what this
face lists is promised (tests/api/face.txt holds its names and signatures)."""

from __future__ import annotations

from lta_worker.api._api import Changes, LtaApi
from lta_worker.api._payloads import (
    FeedLine,
    ResultChangedData,
    ResultChangedEvent,
    ResultLine,
    UserEvent,
    UserEventData,
    UserForgottenLine,
    UserStatus,
    WebhookEvent,
)
from lta_worker.config import Settings, load_settings
from lta_worker.domain import ActionCode
from lta_worker.enrollment import DropResult, EnrollResult
from lta_worker.errors import (
    ConfigError,
    CursorError,
    EnrollmentError,
    InstanceLockedError,
    KeyFileError,
    LtaError,
    ModeNotOpenedError,
    NoDatabaseError,
    SchemaOutdatedError,
    SchemaTooNewError,
    StorageError,
    UnknownKeyError,
    UnknownUserError,
    UpstreamError,
    UsageError,
)
from lta_worker.logs import SecretFilter

__all__ = [
    "ActionCode",
    "Changes",
    "ConfigError",
    "CursorError",
    "DropResult",
    "EnrollResult",
    "EnrollmentError",
    "FeedLine",
    "InstanceLockedError",
    "KeyFileError",
    "LtaApi",
    "LtaError",
    "ModeNotOpenedError",
    "NoDatabaseError",
    "ResultChangedData",
    "ResultChangedEvent",
    "ResultLine",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "SecretFilter",
    "Settings",
    "StorageError",
    "UnknownKeyError",
    "UnknownUserError",
    "UpstreamError",
    "UsageError",
    "UserEvent",
    "UserEventData",
    "UserForgottenLine",
    "UserStatus",
    "WebhookEvent",
    "load_settings",
]
