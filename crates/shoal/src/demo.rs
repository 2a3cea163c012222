//! `shoal demo`: a local cluster on loopback. (Owned by the runtime work.)
