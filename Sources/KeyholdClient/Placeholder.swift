// KeyholdClient: see the target's files.
