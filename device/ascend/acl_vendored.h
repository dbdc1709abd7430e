/*
 * UCM: the subset of the Ascend ACL runtime API that ucm-device calls.
 *
 * bindgen reads this header when no CANN toolkit is installed; with a
 * toolkit it reads the real <acl/acl.h> instead. Every declaration and enum
 * value below was checked against the public CANN headers and docs:
 *
 *  [base]  include/external/acl/acl_base_rt.h (hicann/runtime, CANN 8.x):
 *          aclrtStream, aclrtEvent, aclError typedefs.
 *  [rt]    include/external/acl/acl_rt.h (hicann/runtime, CANN 8.x, ACL 1.15):
 *          stream flags, enums, structs and function prototypes.
 *  [doc]   CANN application development API reference
 *          (hiascend.com, "aclrtMemcpyAsync", "aclrtStreamWaitEvent",
 *          "aclrtQueryEventStatus", "aclrtCreateStreamWithConfig",
 *          "aclrtHostRegisterType", "aclrtMemcpyBatchAttr").
 * Checked 2026-11-29. Error codes live in Rust (ascend/result.rs), checked
 * against acl_base_rt.h the same way.
 */
#ifndef UCM_ACL_VENDORED_H
#define UCM_ACL_VENDORED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* [base] */
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef int aclError;

/* [rt] "for create stream"; [doc] aclrtCreateStreamWithConfig flag values. */
#define ACL_STREAM_FAST_LAUNCH 0x00000001U
#define ACL_STREAM_FAST_SYNC 0x00000002U

/* [rt] [doc] aclrtMemcpyAsync: HOST_TO_HOST = 0 ... DEVICE_TO_DEVICE = 3. */
typedef enum aclrtMemcpyKind {
    ACL_MEMCPY_HOST_TO_HOST = 0,
    ACL_MEMCPY_HOST_TO_DEVICE = 1,
    ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
    ACL_MEMCPY_DEFAULT = 4,
} aclrtMemcpyKind;

/* [rt] aclrtMemMallocPolicy (first three members). */
typedef enum aclrtMemMallocPolicy {
    ACL_MEM_MALLOC_HUGE_FIRST = 0,
    ACL_MEM_MALLOC_HUGE_ONLY = 1,
    ACL_MEM_MALLOC_NORMAL_ONLY = 2,
} aclrtMemMallocPolicy;

/* [rt] [doc] aclrtQueryEventStatus. */
typedef enum aclrtEventRecordedStatus {
    ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
    ACL_EVENT_RECORDED_STATUS_COMPLETE = 1,
} aclrtEventRecordedStatus;

/* [rt] [doc] aclrtHostRegisterType. */
typedef enum aclrtHostRegisterType {
    ACL_HOST_REGISTER_MAPPED = 0,
} aclrtHostRegisterType;

/* [rt] aclrtMemLocationType, aclrtMemLocation, aclrtMemcpyBatchAttr. */
typedef enum aclrtMemLocationType {
    ACL_MEM_LOCATION_TYPE_HOST = 0,
    ACL_MEM_LOCATION_TYPE_DEVICE = 1,
} aclrtMemLocationType;

typedef struct aclrtMemLocation {
    uint32_t id;
    aclrtMemLocationType type;
} aclrtMemLocation;

typedef struct {
    aclrtMemLocation dstLoc;
    aclrtMemLocation srcLoc;
    uint8_t rsv[16];
} aclrtMemcpyBatchAttr;

/* [rt] host function run in stream order (aclrtLaunchHostFunc). */
typedef void (*aclrtHostFunc)(void *args);

/* Initialisation and devices. [rt] */
aclError aclInit(const char *configPath);
aclError aclFinalize(void);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtSynchronizeDevice(void);
const char *aclGetRecentErrMsg(void);

/* Memory. [rt] */
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFreeHost(void *hostPtr);
aclError aclrtHostRegister(void *ptr, uint64_t size, aclrtHostRegisterType type, void **devPtr);
aclError aclrtHostUnregister(void *ptr);

/* Streams. [rt] [doc] */
aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args);

/* Events. [rt] [doc] */
aclError aclrtCreateEvent(aclrtEvent *event);
aclError aclrtDestroyEvent(aclrtEvent event);
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status);
aclError aclrtSynchronizeEvent(aclrtEvent event);
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);

/* Copies. [rt] [doc]: source and destination must be 64-byte aligned. */
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream stream);
aclError aclrtMemcpyBatchAsync(void **dsts, size_t *destMaxs, void **srcs, size_t *sizes,
                               size_t numBatches, aclrtMemcpyBatchAttr *attrs,
                               size_t *attrsIndexes, size_t numAttrs, size_t *failIndex,
                               aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* UCM_ACL_VENDORED_H */
