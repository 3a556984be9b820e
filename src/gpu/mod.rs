//! GPU codecs: CUDA context/stream handling, NVRTC kernel compilation and device workspaces.
