// KeyholdProtocol: see the target's files.
