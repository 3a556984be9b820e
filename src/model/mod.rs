//! The overall-speedup model (AATROX §5.6) and the per-message compression policy.
