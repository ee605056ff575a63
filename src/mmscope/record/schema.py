"""The tables of an `nsys export --type sqlite` file that a recording holds, as nsys declares them.

Columns, types and NULL-ability follow schema 3.28.1 (docs/design.md §6); enum rows carry nsys's names.
"""
from __future__ import annotations

SCHEMA_VERSION = "3.28.1"

NVTX_EVENTS = (
    "CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, "
    "rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, "
    "endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER, "
    "int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, "
    "floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT, "
    "eventId INTEGER NOT NULL PRIMARY KEY)")

SUPPORTING = [
    "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER)",
    "CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT)",
    "CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, "
    "localTime TEXT, systemClockNs INTEGER, sessionStartCntVctNs INTEGER)",
    "CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, "
    "startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL)",
    "CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT)",
    "CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT)",
    "CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT)",
    "CREATE TABLE ENUM_NSYS_EVENT_CLASS (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT)",
]

# A capture without GPU activity still has these, empty: readers look for the kernel table
# before anything else, and join NVTX ranges to the runtime table.
_GPU_OP = ("start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
           "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
           "correlationId INTEGER, globalPid INTEGER, ")
CUPTI = [
    "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, "
    "nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER)",
    "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (" + _GPU_OP +
    "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, "
    "launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, "
    "gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, "
    "blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
    "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, "
    "localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, "
    "gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER, "
    "sharedMemoryLimitConfig INTEGER, qmdBulkReleaseDone INTEGER, qmdPreexitDone INTEGER, "
    "qmdLastCtaDone INTEGER, graphId INTEGER, clusterX INTEGER, clusterY INTEGER, "
    "clusterZ INTEGER, clusterSchedulingPolicy INTEGER, maxPotentialClusterSize INTEGER, "
    "maxActiveClusters INTEGER, sharedMemoryRequestedPercentage INTEGER, "
    "tensorSizeMinusOneElements TEXT NOT NULL)",
    "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (" + _GPU_OP +
    "bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, "
    "srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, "
    "dstDeviceId INTEGER, dstContextId INTEGER, migrationCause INTEGER, graphNodeId INTEGER, "
    "virtualAddress INTEGER, copyCount INTEGER)",
    "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (" + _GPU_OP +
    "value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER)",
    "CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (" + _GPU_OP +
    "syncType INTEGER NOT NULL, eventId INTEGER NOT NULL, eventSyncId INTEGER)",
]

# Every id that appears in published exports and in readers' sources; nsys's label of an event
# type is its name.
EVENT_TYPES = [
    (32, "NvtxEvents"), (33, "NvtxCategory"), (34, "NvtxMark"), (35, "NvtxPushRange"),
    (36, "NvtxPopRange"), (37, "NvtxStartRange"), (38, "NvtxEndRange"), (39, "NvtxThread"),
    (59, "NvtxPushPopRange"), (60, "NvtxStartEndRange"), (70, "NvtxtPushPopRange"),
    (71, "NvtxtStartEndRange"), (75, "NvtxDomainCreate"), (76, "NvtxDomainDestroy"),
    (79, "CudaDeviceKernel"), (80, "CudaDeviceMemory"),
]
EVENT_CLASSES = [
    (0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA runtime"),
    (1, "TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA driver"),
    (6, "TRACE_PROCESS_EVENT_NVTX_START", "NVTX start"),
    (7, "TRACE_PROCESS_EVENT_NVTX_FINISH", "NVTX finish"),
    (26, "TRACE_PROCESS_EVENT_CUDA_API", "CUDA API"),
    (27, "TRACE_PROCESS_EVENT_OS_RUNTIME", "OSRT runtime"),
    (28, "TRACE_PROCESS_EVENT_CUDNN", "cuDNN"),
    (29, "TRACE_PROCESS_EVENT_CUBLAS", "cuBLAS"),
]

ALL_TABLES = [NVTX_EVENTS, *SUPPORTING, *CUPTI]
