"""Pure construction of RFC 3161 time-stamp requests, tokens, responses and TSA certificates.

An RFC 3161 time-stamping authority (TSA) answers a ``TimeStampReq`` (a hash of the client's
data) with a ``TimeStampResp`` holding a token: a CMS ``SignedData`` (RFC 5652) whose content is
a ``TSTInfo`` (the hash, the time, a serial and the policy). Everything around the one
private-key operation is public data, so this package builds and parses it without any I/O, one
module a part, in the order a TSA needs them:

* `request`: `parse_request` checks a request and returns a `TimeStampRequest`, or raises
  `response.Rejection`;
* `response`: `rejection` turns a rejection into the ``TimeStampResp`` to send back, `granted`
  a token into the response that carries it;
* `tstinfo`: `TokenFields`, encoded as ``TSTInfo`` by `tst_info` and read back;
* `token`: the ``SignedData`` around it: `signed_attributes` (what the key signs),
  `signed_data`, `prepare_token` and `token`; `parse_token` reads a token back (for
  verification tools);
* `certificates`: the TSA certificate, made the same way from a key an agent holds, or a
  PKCS#10 request for it to an outside CA;
* `algorithms`: the hash and signature algorithms (`signature_hash`, `ecdsa_signature`);
  `der`: the DER building blocks the others share; `errors`: `TspError`.

Nothing is re-exported here: import each name from the module that holds it.
"""
