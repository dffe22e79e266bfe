//! libemp
