"""This server as a witness of other transparency logs (c2sp.org/tlog-witness,
docs/witness.md): `server.witness.service.Witness` checks each ``add-checkpoint`` request,
stores the checkpoint atomically (compare and set) and only then has the witness key cosign it.
"""
