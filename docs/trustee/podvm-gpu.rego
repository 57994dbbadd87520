# podvm-gpu: a Trustee attestation-service policy fragment that releases secrets only to a pod
# VM whose GPUs podvm-gpu attested in this boot (docs/interface.md 3.14, docs/operating.md
# "Binding the GPUs' verdict to the TEE").
#
# Written to Trustee's own input and engine: its TDX verifier (v0.15.0 and later) replays the
# CCEL and the attestation-agent's log (AAEL) against the RTMRs and gives every entry, firmware
# first, as input.tdx.uefi_event_logs[i] with index, type_name, digests, event (base64),
# digest_matches_event and details; for an AAEL event details.unicode_name is "AAEL" and
# details.data.{domain, operation, content} the text split at its first two spaces, the content
# already parsed when it is JSON (an object here) and a string only when it is not
# (deps/eventlog/src/ccel/event_tag.rs). Trustee evaluates with regorus, where a builtin's type
# error fails the whole evaluation: so an object content is read as is and json.unmarshal is
# called only on a string that json.is_valid accepts. Tested with regorus (PyPI opa-eval) and
# rego-cpp (PyPI regopy) on inputs built as Trustee builds them (tests/test_trustee_policy.py).
#
# Merge the rules into your own policy (package policy) and use podvm_gpu_attested where a claim
# must depend on the GPUs, for example:
#
#     hardware := 2 if { ...your TDX checks...; podvm_gpu_attested }
#
# podvm_gpu_attested holds when, among the RTMR3 records (index 4, EV_NO_ACTION aside):
# - every EV_EVENT_TAG record's text is the one extended (digest_matches_event == true): Trustee
#   computes the flag but does not refuse on it, and the log travels beside the quote, so
#   without it a podvm-gpu "fail" rewritten to "pass" (its digest kept) would replay. Firmware
#   records are not held to it (some are legitimately false);
# - podvm-gpu's first event (AAEL, domain podvm_gpu_domain, operation GpuAttestation) is
#   preceded only by AAEL events of a domain in podvm_gpu_earlier_domains (empty: nothing may
#   come first; cloud-api-adaptor #2604 proposes an initdata event there: list its domain
#   once you run it). An event someone appends later cannot forge a first "pass";
# - that first event says "pass" with at least podvm_gpu_min_gpus GPUs in CC mode "on" or
#   "ppcie" (not dev-tools), and an architecture in podvm_gpu_architectures when that is set;
# - every podvm-gpu event is readable (content version 1 or 2, result pass, fail or none) and
#   none says "fail": a real later "fail" (the boot failed after attesting, a rerun failed, the
#   watcher revoked) revokes; an event that cannot be read refuses.
# A boot that died before it wrote anything leaves no podvm-gpu event: refused. Version 1's
# domain ("podvm-gpu", before issue 43) is not accepted.
package policy

import rego.v1

# Edit: the fewest GPUs a pod VM must have attested.
podvm_gpu_min_gpus := 1

# Edit: the AAEL domains whose RTMR3 events may come before podvm-gpu's first event.
podvm_gpu_earlier_domains := set()

# Edit: the GPU architectures accepted (podvm_gpu/pci_ids.py's names: "Hopper", "Blackwell");
# empty: any. Read from content version 2: a version-1 event has none and is refused when set.
podvm_gpu_architectures := set()

# podvm-gpu's AAEL domain and operation (docs/interface.md 3.14): fixed, never edit.
podvm_gpu_domain := "urn:uuid:393acf0b-2e7d-4084-a54e-933012df6af5"

podvm_gpu_operation := "GpuAttestation"

podvm_gpu_rtmr3 := [e |
	some e in input.tdx.uefi_event_logs
	e.index == 4
	e.type_name != "EV_NO_ACTION"
]

podvm_gpu_is_ours(e) if {
	e.type_name == "EV_EVENT_TAG"
	e.details.unicode_name == "AAEL"
	e.details.data.domain == podvm_gpu_domain
	e.details.data.operation == podvm_gpu_operation
}

# The positions of podvm-gpu's events in podvm_gpu_rtmr3.
podvm_gpu_at := {i |
	some i
	e := podvm_gpu_rtmr3[i] # bound first: rego-cpp enumerates no index inside a call
	podvm_gpu_is_ours(e)
}

# A tagged record's text is what was extended; other records are not judged here.
podvm_gpu_intact(e) if e.type_name != "EV_EVENT_TAG"

podvm_gpu_intact(e) if e.digest_matches_event == true

podvm_gpu_listed(e) if {
	e.type_name == "EV_EVENT_TAG"
	e.details.unicode_name == "AAEL"
	e.details.data.domain in podvm_gpu_earlier_domains
}

# The content as an object: as Trustee gives it, or parsed from a string (an older Trustee).
podvm_gpu_content(e) := c if {
	c := e.details.data.content
	is_object(c)
}

podvm_gpu_content(e) := c if {
	is_string(e.details.data.content)
	json.is_valid(e.details.data.content)
	c := json.unmarshal(e.details.data.content)
	is_object(c)
}

# A readable podvm-gpu content: version 1 or 2, a known result.
podvm_gpu_said(e) := c if {
	c := podvm_gpu_content(e)
	c.version in {1, 2}
	c.result in {"pass", "fail", "none"}
}

podvm_gpu_architecture_ok(said) if count(podvm_gpu_architectures) == 0

podvm_gpu_architecture_ok(said) if said.architecture in podvm_gpu_architectures

default podvm_gpu_attested := false

podvm_gpu_attested if {
	count(podvm_gpu_at) > 0
	first := min(podvm_gpu_at)
	every e in podvm_gpu_rtmr3 {
		podvm_gpu_intact(e)
	}
	earlier := array.slice(podvm_gpu_rtmr3, 0, first)
	every e in earlier {
		podvm_gpu_listed(e)
	}
	said := podvm_gpu_said(podvm_gpu_rtmr3[first])
	said.result == "pass"
	is_number(said.gpus)
	said.gpus >= podvm_gpu_min_gpus
	said.cc_mode in {"on", "ppcie"} # not dev-tools mode (no production confidentiality)
	podvm_gpu_architecture_ok(said)
	every i in podvm_gpu_at {
		podvm_gpu_said(podvm_gpu_rtmr3[i]).result != "fail"
	}
}
