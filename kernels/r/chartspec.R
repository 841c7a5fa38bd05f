# A plot's data read back, in the shape of kernels/python/chartspec.py's: type, title, axis
# labels and series (line, scatter, bar, pie). Sourced by kernel.R into the `gateway`
# environment. Best effort and bounded: a plot it cannot read gives NULL, never an error.
#
# - ggplot2: each printed plot is queued (an S3 `print` method of ours around ggplot2's,
#   set once ggplot2 loads) and read with `ggplot_build()` when IRkernel records the page
#   it drew; one series per layer and group.
# - base graphics: the recorded page's display list: `plot.xy` calls (points and lines),
#   `rect` (bars: barplot, hist) and `title`.

.gateway_max_points <- 1000L
.gateway_ggplots <- list()

.gateway_json <- function(x) {
    jsonlite::toJSON(x, auto_unbox = TRUE, digits = NA, na = "null", null = "null")
}

.gateway_forget_plots <- function() {
    assign(".gateway_ggplots", list(), envir = as.environment("gateway"))
}

.gateway_values <- function(v) {
    v <- utils::head(v, .gateway_max_points)
    if (is.factor(v)) v <- as.character(v)
    if (inherits(v, c("Date", "POSIXt"))) v <- format(v)
    if (is.numeric(v)) v[!is.finite(v)] <- NA
    I(if (is.numeric(v) || is.character(v) || is.logical(v)) v else as.character(v))
}

.gateway_text <- function(x) {
    if (is.null(x) || length(x) == 0L) return(NULL)
    if (is.expression(x)) x <- x[[1L]]
    if (is.call(x) || is.name(x)) x <- deparse(x)
    x <- paste(as.character(x), collapse = " ")
    if (is.na(x) || !nzchar(x)) NULL else x
}

.gateway_spec <- function(kind, title, x_label, y_label, series) {
    kinds <- unique(vapply(series, function(s) s$type, ""))
    list(
        type = if (length(kinds) == 1L) kinds else if (length(kinds)) "mixed" else "unknown",
        title = title, x_label = x_label, y_label = y_label,
        series = series, axes = NULL)
}

# --- ggplot2 ---------------------------------------------------------------------------------

.gateway_geom_kind <- function(geom, polar) {
    if (polar && geom %in% c("GeomBar", "GeomCol", "GeomRect")) return("pie")
    switch(geom,
        GeomLine = , GeomPath = , GeomStep = , GeomSmooth = , GeomArea = "line",
        GeomPoint = , GeomJitter = , GeomCount = "scatter",
        GeomBar = , GeomCol = , GeomHistogram = , GeomRect = , GeomTile = "bar",
        NULL)
}

.gateway_ggplot_spec <- function(plot) {
    built <- ggplot2::ggplot_build(plot)
    polar <- inherits(built$layout$coord, "CoordPolar")
    labels <- built$plot$labels
    # series are named by a discrete colour or fill scale: each row's colour, mapped back
    key <- NULL
    for (aesthetic in c("colour", "fill")) {
        scale <- built$plot$scales$get_scales(aesthetic)
        if (!is.null(scale) && scale$is_discrete()) {
            limits <- as.character(scale$get_limits())
            key <- list(aesthetic = aesthetic, limits = limits, colours = scale$map(limits))
            break
        }
    }
    x_scale <- built$layout$panel_scales_x[[1L]]
    ticks <- if (!is.null(x_scale) && x_scale$is_discrete()) as.character(x_scale$get_limits())
    series <- list()
    for (i in seq_along(built$data)) {
        kind <- .gateway_geom_kind(class(plot$layers[[i]]$geom)[1L], polar)
        data <- built$data[[i]]
        if (is.null(kind) || is.null(data$x) && is.null(data$y)) next
        names <- if (!is.null(key) && !is.null(data[[key$aesthetic]])) {
            key$limits[match(data[[key$aesthetic]], key$colours)]
        }
        height <- if (kind %in% c("bar", "pie") && !is.null(data$ymax)) {
            data$ymax - (if (is.null(data$ymin)) 0 else data$ymin)
        } else data$y
        if (kind == "pie") {
            series[[length(series) + 1L]] <- list(
                type = "pie", label = NULL, y = .gateway_values(height),
                labels = I(utils::head(as.character(names %||% character(0)),
                                       .gateway_max_points)))
            next
        }
        # one series per name; unnamed lines and points per group, unnamed bars as one
        split_by <- if (!is.null(names)) names
                    else if (kind == "bar" || is.null(data$group)) rep("", nrow(data))
                    else as.character(data$group)
        for (part in unique(split_by)) {
            rows <- which(split_by == part)
            entry <- list(type = kind, label = if (!is.null(names)) part,
                          x = .gateway_values(data$x[rows]), y = .gateway_values(height[rows]))
            if (kind == "bar" && !is.null(ticks)) entry$tick_labels <- I(ticks)
            series[[length(series) + 1L]] <- entry
        }
    }
    .gateway_spec(NULL, .gateway_text(labels$title), .gateway_text(labels$x),
                  .gateway_text(labels$y), series)
}

# ggplot2's print, queueing the plot for the page it draws
.gateway_print_ggplot <- function(x, ...) {
    queue <- get(".gateway_ggplots", envir = as.environment("gateway"))
    assign(".gateway_ggplots", c(queue, list(x)), envir = as.environment("gateway"))
    ggplot2_print <- get("print.ggplot", envir = asNamespace("ggplot2"))
    ggplot2_print(x, ...)
}

.gateway_watch_ggplot2 <- function(...) {
    registerS3method("print", "ggplot", .gateway_print_ggplot, envir = asNamespace("ggplot2"))
    # ggplot2 4 plots are S7 objects of class "ggplot2::ggplot"
    registerS3method("print", "ggplot2::ggplot", .gateway_print_ggplot,
                     envir = asNamespace("ggplot2"))
}
setHook(packageEvent("ggplot2", "onLoad"), .gateway_watch_ggplot2)

# --- base graphics ---------------------------------------------------------------------------

.gateway_call_name <- function(item) {
    f <- tryCatch(item[[2L]][[1L]], error = function(e) NULL)
    if (is.list(f) && !is.null(f$name)) f$name else ""
}

.gateway_base_spec <- function(plotobj) {
    items <- plotobj[[1L]]
    if (!length(items)) return(NULL)
    series <- list()
    title <- x_label <- y_label <- NULL
    bars <- NULL
    ticks <- NULL
    for (item in items) {
        args <- as.list(item[[2L]])[-1L]
        name <- .gateway_call_name(item)
        if (name == "C_plotXY") {
            xy <- args[[1L]]
            type <- as.character(args[[2L]])[1L]
            kind <- if (type %in% c("p", "n")) "scatter" else "line"
            if (type == "n") next
            series[[length(series) + 1L]] <- list(
                type = kind, label = NULL,
                x = .gateway_values(xy$x), y = .gateway_values(xy$y))
        } else if (name == "C_rect") {
            x <- (args[[1L]] + args[[3L]]) / 2
            y <- args[[4L]] - args[[2L]]
            bars <- list(x = c(bars$x, x), y = c(bars$y, y))
        } else if (name == "C_title") {
            title <- .gateway_text(args[[1L]]) %||% title
            x_label <- .gateway_text(args[[3L]]) %||% x_label
            y_label <- .gateway_text(args[[4L]]) %||% y_label
        } else if (name == "C_axis" && identical(as.numeric(args[[1L]]), 1) &&
                   is.character(args[[3L]])) {
            ticks <- args[[3L]]
        }
    }
    # a legend's box is a rectangle too: one among lines or points is not a bar chart
    if (!is.null(bars) && length(bars$x) == 1L && length(series)) bars <- NULL
    if (!is.null(bars)) {
        entry <- list(type = "bar", label = NULL, x = .gateway_values(bars$x),
                      y = .gateway_values(bars$y))
        if (!is.null(ticks)) entry$tick_labels <- I(utils::head(ticks, .gateway_max_points))
        series <- c(list(entry), series)
    }
    if (!length(series) && is.null(title)) return(NULL)
    .gateway_spec(NULL, title, x_label, y_label, series)
}

`%||%` <- function(a, b) if (is.null(a)) b else a

# The spec of the page IRkernel recorded: the oldest ggplot printed since the last page,
# else the page's own display list.
.gateway_plot_spec <- function(plotobj) {
    tryCatch({
        queue <- get(".gateway_ggplots", envir = as.environment("gateway"))
        if (length(queue)) {
            assign(".gateway_ggplots", queue[-1L], envir = as.environment("gateway"))
            .gateway_ggplot_spec(queue[[1L]])
        } else {
            .gateway_base_spec(plotobj)
        }
    }, error = function(e) NULL)
}
