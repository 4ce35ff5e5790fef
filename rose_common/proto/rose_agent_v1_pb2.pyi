from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Backend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_UNSPECIFIED: _ClassVar[Backend]
    BACKEND_CUDA_CHECKPOINT: _ClassVar[Backend]
    BACKEND_COOPERATIVE: _ClassVar[Backend]
    BACKEND_SIMULATED: _ClassVar[Backend]

class CommandKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_KIND_UNSPECIFIED: _ClassVar[CommandKind]
    COMMAND_KIND_SUSPEND: _ClassVar[CommandKind]
    COMMAND_KIND_RESUME: _ClassVar[CommandKind]
    COMMAND_KIND_CHECKPOINT: _ClassVar[CommandKind]

class WorkloadState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKLOAD_STATE_UNSPECIFIED: _ClassVar[WorkloadState]
    WORKLOAD_STATE_RUNNING: _ClassVar[WorkloadState]
    WORKLOAD_STATE_SUSPENDING: _ClassVar[WorkloadState]
    WORKLOAD_STATE_SUSPENDED: _ClassVar[WorkloadState]
    WORKLOAD_STATE_RESUMING: _ClassVar[WorkloadState]
    WORKLOAD_STATE_CHECKPOINTED_EVICTED: _ClassVar[WorkloadState]

class OperationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_STATE_UNSPECIFIED: _ClassVar[OperationState]
    OPERATION_STATE_PENDING: _ClassVar[OperationState]
    OPERATION_STATE_RUNNING: _ClassVar[OperationState]
    OPERATION_STATE_SUCCEEDED: _ClassVar[OperationState]
    OPERATION_STATE_FAILED: _ClassVar[OperationState]
BACKEND_UNSPECIFIED: Backend
BACKEND_CUDA_CHECKPOINT: Backend
BACKEND_COOPERATIVE: Backend
BACKEND_SIMULATED: Backend
COMMAND_KIND_UNSPECIFIED: CommandKind
COMMAND_KIND_SUSPEND: CommandKind
COMMAND_KIND_RESUME: CommandKind
COMMAND_KIND_CHECKPOINT: CommandKind
WORKLOAD_STATE_UNSPECIFIED: WorkloadState
WORKLOAD_STATE_RUNNING: WorkloadState
WORKLOAD_STATE_SUSPENDING: WorkloadState
WORKLOAD_STATE_SUSPENDED: WorkloadState
WORKLOAD_STATE_RESUMING: WorkloadState
WORKLOAD_STATE_CHECKPOINTED_EVICTED: WorkloadState
OPERATION_STATE_UNSPECIFIED: OperationState
OPERATION_STATE_PENDING: OperationState
OPERATION_STATE_RUNNING: OperationState
OPERATION_STATE_SUCCEEDED: OperationState
OPERATION_STATE_FAILED: OperationState

class RegisterRequest(_message.Message):
    __slots__ = ("pod_uid", "pid", "state_bytes", "supported_backends", "pod_namespace", "pod_name", "claim_uids", "checkpoint_path", "current_state")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    CLAIM_UIDS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STATE_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    pid: int
    state_bytes: int
    supported_backends: _containers.RepeatedScalarFieldContainer[Backend]
    pod_namespace: str
    pod_name: str
    claim_uids: _containers.RepeatedScalarFieldContainer[str]
    checkpoint_path: str
    current_state: WorkloadState
    def __init__(self, pod_uid: _Optional[str] = ..., pid: _Optional[int] = ..., state_bytes: _Optional[int] = ..., supported_backends: _Optional[_Iterable[_Union[Backend, str]]] = ..., pod_namespace: _Optional[str] = ..., pod_name: _Optional[str] = ..., claim_uids: _Optional[_Iterable[str]] = ..., checkpoint_path: _Optional[str] = ..., current_state: _Optional[_Union[WorkloadState, str]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("session_id", "node_name")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    node_name: str
    def __init__(self, session_id: _Optional[str] = ..., node_name: _Optional[str] = ...) -> None: ...

class CommandsRequest(_message.Message):
    __slots__ = ("pod_uid", "session_id")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    session_id: str
    def __init__(self, pod_uid: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("operation_id", "kind", "backend", "deadline_unix_ms", "grace_seconds", "reason")
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    kind: CommandKind
    backend: Backend
    deadline_unix_ms: int
    grace_seconds: float
    reason: str
    def __init__(self, operation_id: _Optional[str] = ..., kind: _Optional[_Union[CommandKind, str]] = ..., backend: _Optional[_Union[Backend, str]] = ..., deadline_unix_ms: _Optional[int] = ..., grace_seconds: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class AcknowledgeRequest(_message.Message):
    __slots__ = ("pod_uid", "session_id", "operation_id", "ok", "bytes_moved", "seconds", "message", "checkpoint_path", "checkpoint_sha256")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SHA256_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    session_id: str
    operation_id: str
    ok: bool
    bytes_moved: int
    seconds: float
    message: str
    checkpoint_path: str
    checkpoint_sha256: str
    def __init__(self, pod_uid: _Optional[str] = ..., session_id: _Optional[str] = ..., operation_id: _Optional[str] = ..., ok: _Optional[bool] = ..., bytes_moved: _Optional[int] = ..., seconds: _Optional[float] = ..., message: _Optional[str] = ..., checkpoint_path: _Optional[str] = ..., checkpoint_sha256: _Optional[str] = ...) -> None: ...

class AcknowledgeResponse(_message.Message):
    __slots__ = ("accepted", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class UpdateStateSizeRequest(_message.Message):
    __slots__ = ("pod_uid", "session_id", "state_bytes")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    session_id: str
    state_bytes: int
    def __init__(self, pod_uid: _Optional[str] = ..., session_id: _Optional[str] = ..., state_bytes: _Optional[int] = ...) -> None: ...

class UpdateStateSizeResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class SuspendRequest(_message.Message):
    __slots__ = ("pod_uid", "grace_seconds", "reason", "no_wait")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NO_WAIT_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    grace_seconds: float
    reason: str
    no_wait: bool
    def __init__(self, pod_uid: _Optional[str] = ..., grace_seconds: _Optional[float] = ..., reason: _Optional[str] = ..., no_wait: _Optional[bool] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("pod_uid", "no_wait")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    NO_WAIT_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    no_wait: bool
    def __init__(self, pod_uid: _Optional[str] = ..., no_wait: _Optional[bool] = ...) -> None: ...

class GetOperationRequest(_message.Message):
    __slots__ = ("operation_id",)
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    def __init__(self, operation_id: _Optional[str] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("id", "pod_uid", "kind", "state", "backend", "bytes_moved", "duration_seconds", "fallback", "message", "started_unix_ms", "finished_unix_ms", "checkpoint_path")
    ID_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    id: str
    pod_uid: str
    kind: CommandKind
    state: OperationState
    backend: Backend
    bytes_moved: int
    duration_seconds: float
    fallback: str
    message: str
    started_unix_ms: int
    finished_unix_ms: int
    checkpoint_path: str
    def __init__(self, id: _Optional[str] = ..., pod_uid: _Optional[str] = ..., kind: _Optional[_Union[CommandKind, str]] = ..., state: _Optional[_Union[OperationState, str]] = ..., backend: _Optional[_Union[Backend, str]] = ..., bytes_moved: _Optional[int] = ..., duration_seconds: _Optional[float] = ..., fallback: _Optional[str] = ..., message: _Optional[str] = ..., started_unix_ms: _Optional[int] = ..., finished_unix_ms: _Optional[int] = ..., checkpoint_path: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("pod_uid",)
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    def __init__(self, pod_uid: _Optional[str] = ...) -> None: ...

class WorkloadStatus(_message.Message):
    __slots__ = ("pod_uid", "pid", "state", "state_bytes", "supported_backends", "connected", "host_bytes_held", "claim_uids", "suspended_by", "pod_namespace", "pod_name")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_HELD_FIELD_NUMBER: _ClassVar[int]
    CLAIM_UIDS_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_BY_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    pid: int
    state: WorkloadState
    state_bytes: int
    supported_backends: _containers.RepeatedScalarFieldContainer[Backend]
    connected: bool
    host_bytes_held: int
    claim_uids: _containers.RepeatedScalarFieldContainer[str]
    suspended_by: Backend
    pod_namespace: str
    pod_name: str
    def __init__(self, pod_uid: _Optional[str] = ..., pid: _Optional[int] = ..., state: _Optional[_Union[WorkloadState, str]] = ..., state_bytes: _Optional[int] = ..., supported_backends: _Optional[_Iterable[_Union[Backend, str]]] = ..., connected: _Optional[bool] = ..., host_bytes_held: _Optional[int] = ..., claim_uids: _Optional[_Iterable[str]] = ..., suspended_by: _Optional[_Union[Backend, str]] = ..., pod_namespace: _Optional[str] = ..., pod_name: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("workloads", "host_budget_bytes", "host_bytes_held", "recent_operations")
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    HOST_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_HELD_FIELD_NUMBER: _ClassVar[int]
    RECENT_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    workloads: _containers.RepeatedCompositeFieldContainer[WorkloadStatus]
    host_budget_bytes: int
    host_bytes_held: int
    recent_operations: _containers.RepeatedCompositeFieldContainer[Operation]
    def __init__(self, workloads: _Optional[_Iterable[_Union[WorkloadStatus, _Mapping]]] = ..., host_budget_bytes: _Optional[int] = ..., host_bytes_held: _Optional[int] = ..., recent_operations: _Optional[_Iterable[_Union[Operation, _Mapping]]] = ...) -> None: ...
