// Package snapshot is the file-transfer snapshot of a replication group
// (design replication.md §3.5): a follower that fell behind what the
// leader still holds in its raft log gets the leader's commitlog files
// instead of entries.
//
// A snapshot at raft index S is a Manifest, carried as the Data of raft's
// MsgSnap: the commitlog file size, the oldest file kept (MinOffset), the
// commit end at S (End), every file from MinOffset to End with the CRC-32C
// of the bytes sent (whole sealed files, and the prefix of the last file up
// to End), the newest store time and each consume queue's first and next
// offsets. The sender streams the files in Chunks, each with its own
// CRC-32C (Read); the receiver writes them into a Stage, a directory inside
// its data dir, checking every chunk against the manifest as it arrives
// (the file must be the next one, the offset the next one, the bytes within
// the file's size and the chunk's CRC right, and each file's CRC right at
// its end), so a hostile or broken sender can neither make it allocate
// more than one chunk nor write past the files the manifest declares.
// Finish then scans every record of the staged files with the commitlog's
// recovery scan (record CRCs, PHYSICALOFFSET, batches whole), requires
// the scan to end exactly at End, and syncs the files and the directory.
// Only then may the MsgSnap be stepped into raft. Any error leaves the
// stage to Discard, which removes it: nothing stored outside it changes.
//
// The package knows the commitlog as files of records and nothing of raft
// or gRPC: the store builds the manifest (its raft index, term and queue
// table) and the peer transport carries the bytes.
package snapshot
