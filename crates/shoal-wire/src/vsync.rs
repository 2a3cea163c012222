//! Bodies of [`crate::Packet::Vsync`] packets: virtual synchrony and
//! membership control. (Placeholder: the vsync work defines the operations.)
