//! Packets of the peer channel protocol (proto2): encoding, checked decoding and the field-parity rule.
