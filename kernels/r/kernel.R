# The gateway's R kernel: IRkernel, with the gateway's own code around it.
#
# Started by kernels/r/__main__.py as
#   R --no-echo --vanilla -f kernel.R --args CONNECTION_FILE
# (`--vanilla`: no .Rprofile, .RData or .Renviron of the working folder runs or loads at
# start, as Python kernels start with `-P`). It makes IRkernel's kernel itself, as
# `IRkernel::main()` would, so that it can change a few of its ways:
#
# - messages are JSON with numbers at full precision (IRkernel rounded to 4 decimals), NA
#   as null, and JSON the gateway's code made (`result`, chart specs) inserted as it is;
# - plots (IRkernel's `send_plot`): the PNG's base64 without line breaks, and the chart's
#   data in `metadata.gateway.spec` (kernels/r/chartspec.R);
# - `quit()` / `q()` end the program: code after them does not run, `quit(status = n)`
#   gives the run exit code `n` (the reply's `exit_code`, as our bash kernel reports
#   `$?`); IRkernel's own only asks the front end to stop the kernel;
# - a message's line ends once (IRkernel added a second newline);
# - `readline()` when the request allows no input fails at once (IRkernel waited forever).
#
# The gateway's requests (gateway/execution/kernel_code.py) call the functions of the
# `gateway` environment, attached to the search path:
#   .gateway_prepare(json)    the run's environment variables and `vars`
#   .gateway_result(max)      the global `result` (else `output`) as JSON, sent as an
#                             `execute_result` with `application/json`
local({
    args <- commandArgs(trailingOnly = TRUE)
    if (length(args) < 1L) stop("kernel.R: no connection file")
    here <- Sys.getenv("GATEWAY_R_KERNEL_DIR")
    suppressPackageStartupMessages({
        library(IRkernel)
        library(jsonlite)
    })
    options(jupyter.rich_display = TRUE, warn = 0)

    gateway <- attach(NULL, name = "gateway")
    sys.source(file.path(here, "chartspec.R"), envir = gateway)

    kernel <- IRkernel:::Kernel$new(connection_file = args[[1L]])
    executor <- kernel$executor
    original <- list(
        handle_error = executor$handle_error,
        handle_graphics = executor$handle_graphics,
        execute = executor$execute,
        readline = executor$readline
    )
    # A reference class's methods are bindings of the object's environment, where its other
    # methods find them by name: replacing the binding changes the method for them all.
    replace_method <- function(name, f, object = executor) {
        env <- as.environment(object)
        invisible(object[[name]])  # installed on first use
        if (bindingIsLocked(name, env)) unlockBinding(name, env)
        assign(name, f, envir = env)
    }

    replace_method("msg_to_wire", object = kernel, function(msg) {
        encode <- function(part) {
            charToRaw(jsonlite::toJSON(part, auto_unbox = TRUE, digits = NA, na = "null",
                                       json_verbatim = TRUE))
        }
        body <- list(encode(msg$header), encode(msg$parent_header), encode(msg$metadata),
                     encode(msg$content))
        c(msg$identities, list(charToRaw("<IDS|MSG>")), list(charToRaw(kernel$sign_msg(body))),
          body)
    })

    # --- the run's environment and vars ------------------------------------------------
    reserved <- c("input", "result", "output")
    assign(".gateway_prepare", function(payload) {
        request <- jsonlite::fromJSON(payload, simplifyVector = TRUE,
                                      simplifyDataFrame = FALSE, simplifyMatrix = FALSE)
        env <- request$env
        if (length(env) > 0L) do.call(Sys.setenv, lapply(env, as.character))
        values <- request$vars
        if (length(values) > 0L) {
            assign("input", values, envir = .GlobalEnv)
            for (name in names(values)) {
                if (identical(make.names(name), name) && !(name %in% reserved)) {
                    assign(name, values[[name]], envir = .GlobalEnv)
                }
            }
        }
        invisible(NULL)
    }, envir = gateway)

    # --- result ------------------------------------------------------------------------
    to_json <- function(value) {
        jsonlite::toJSON(value, auto_unbox = TRUE, digits = NA, na = "null", null = "null",
                         dataframe = "rows", factor = "string", POSIXt = "ISO8601",
                         Date = "ISO8601", complex = "string", rownames = FALSE)
    }
    assign(".gateway_result", function(max_bytes = NA) {
        answer <- list(present = FALSE)
        for (name in c("result", "output")) {
            if (!exists(name, envir = .GlobalEnv, inherits = FALSE)) next
            value <- get(name, envir = .GlobalEnv)
            text <- if (is.function(value) || is.environment(value)) {
                simpleError(sprintf("a %s is not JSON-serialisable", class(value)[[1L]]))
            } else {
                tryCatch(to_json(value), error = function(e) e)
            }
            if (inherits(text, "error")) {
                answer <- list(present = TRUE, name = name, error = conditionMessage(text))
            } else if (!is.na(max_bytes) && nchar(text, type = "bytes") > max_bytes) {
                answer <- list(present = TRUE, name = name, size = nchar(text, type = "bytes"))
            } else {
                answer <- list(present = TRUE, name = name, value = text)
            }
            break
        }
        body <- if (is.null(answer$value)) {
            jsonlite::toJSON(answer, auto_unbox = TRUE)
        } else {
            sprintf('{"present": true, "name": %s, "value": %s}',
                    jsonlite::toJSON(answer$name, auto_unbox = TRUE), answer$value)
        }
        executor$send_response("execute_result", executor$current_request, "iopub", list(
            data = list("application/json" = structure(body, class = "json")),
            metadata = IRkernel:::namedlist(),
            execution_count = executor$execution_count))
        invisible(NULL)
    }, envir = gateway)

    # --- quit() ends the program ---------------------------------------------------------
    gateway_quit <- function(save = "default", status = 0, runLast = TRUE) {
        code <- suppressWarnings(as.integer(status))
        if (length(code) != 1L || is.na(code)) code <- 0L
        if (isTRUE(runLast) && exists(".Last", envir = .GlobalEnv, inherits = FALSE)) {
            get(".Last", envir = .GlobalEnv)()
        }
        stop(structure(
            class = c("gateway_exit", "error", "condition"),
            list(message = sprintf("quit(status = %d)", code), call = NULL, status = code)))
    }
    assign("quit", gateway_quit, envir = gateway)
    assign("q", gateway_quit, envir = gateway)

    replace_method("handle_error", function(e) {
        if (!inherits(e, "gateway_exit")) return(original$handle_error(e))
        executor$err <- if (e$status == 0L) list() else list(
            ename = "quit", evalue = conditionMessage(e), traceback = list(),
            exit_code = e$status)
        invisible(NULL)
    })

    # --- streams -----------------------------------------------------------------------
    replace_method("handle_message", function(o) {
        executor$stream(conditionMessage(o), "stderr")
    })

    replace_method("readline", function(prompt = "") {
        if (isFALSE(executor$current_request$content$allow_stdin)) {
            stop("readline(): this run has no standard input", call. = FALSE)
        }
        original$readline(prompt)
    })

    # --- plots -------------------------------------------------------------------------
    replace_method("execute", function(request) {
        gateway$.gateway_forget_plots()
        original$execute(request)
    })

    replace_method("handle_graphics", function(plotobj) {
        attr(plotobj, "gateway_spec") <- gateway$.gateway_plot_spec(plotobj)
        original$handle_graphics(plotobj)
    })

    replace_method("send_plot", function(plotobj) {
        formats <- IRkernel:::namedlist()
        metadata <- IRkernel:::namedlist()
        w <- attr(plotobj, ".irkernel_width")
        h <- attr(plotobj, ".irkernel_height")
        ppi <- attr(plotobj, ".irkernel_ppi")
        for (mime in getOption("jupyter.plot_mimetypes")) {
            tryCatch({
                data <- repr::mime2repr[[mime]](plotobj, w, h)
                # base64 in one line (IRdisplay's breaks it every 76 characters)
                if (is.raw(data)) data <- base64enc::base64encode(data)
                formats[[mime]] <- data
            }, error = original$handle_error)
            if (!identical(mime, "text/plain")) {
                metadata[[mime]] <- list(width = w * ppi, height = h * ppi)
            }
            if (identical(mime, "image/svg+xml")) metadata[[mime]]$isolated <- TRUE
        }
        gateway_meta <- list(source = "display")
        spec <- attr(plotobj, "gateway_spec")
        if (!is.null(spec)) gateway_meta$spec <- spec
        metadata$gateway <- structure(gateway$.gateway_json(gateway_meta), class = "json")
        IRdisplay::publish_mimebundle(formats, metadata)
    })

    assign(".gateway_kernel", kernel, envir = gateway)
    kernel$run()
})
