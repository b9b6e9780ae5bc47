// Package record is the RocketMQ stored-message codec: the byte layout of a
// commitlog record (spec §2), byte-identical to RocketMQ's
// MessageExtEncoder, and everything that reads or writes it.
//
// It owns: the layout constants; Spec, a message prepared outside the
// append lock whose Encode fills in only what depends on the position
// (queue offset, physical offset, store time) and the whole-record CRC;
// Parse, the one walk over a record's fields that every reader shares
// (the dispatcher, the tag-filter check, recovery, Decode), checking every
// length so that no damaged byte panics; Check (Parse plus CRCs); Decode;
// the store's own properties (__CRC32#, the batch extent __BATCH#); the
// offset msgId; the consume-queue tags code; and the message types the
// store takes (Message, Batch, Property), with the property names and
// sysflag bits RocketMQ defines.
//
// It must never import anything but the standard library, never allocate
// on the paths the put and dispatch run per record (Spec.Encode, Parse,
// Check, TagsCodeBytes), and never change the layout: golden files in
// testdata pin it, and RocketMQ's own decoders read what it writes.
package record
