// Placeholder; replaced by the collective conformance suite.
#pragma once
