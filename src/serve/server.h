// `convnets serve` as a process: its life from the models' load through the ports it binds to the drain that SIGTERM or SIGINT starts.
#pragma once

#include "serve/server_options.h"

namespace convnets::serve {

// Loads the models, binds the ports, prints the startup line (models, engine, precision, ports) to stdout and
// serves until SIGTERM or SIGINT; then refuses new requests (503), answers every one already accepted, and
// returns 0. Throws Error for a model that does not load or a port that cannot be bound, before serving.
int run_server(const ServerOptions& options);

}  // namespace convnets::serve
